// pool: being written
