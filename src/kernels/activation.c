// activation: being written
