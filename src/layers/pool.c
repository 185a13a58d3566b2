// pool layer: being written
