// reshape layer: being written
