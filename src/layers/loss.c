// loss layer: being written
