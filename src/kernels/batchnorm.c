// batchnorm: being written
