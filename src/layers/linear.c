// linear layer: being written
