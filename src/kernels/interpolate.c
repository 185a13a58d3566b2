// interpolate: being written
