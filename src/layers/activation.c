// activation layer: being written
