// batchnorm layer: being written
