// conv layer: being written
