// conv: being written
