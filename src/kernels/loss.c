// loss: being written
