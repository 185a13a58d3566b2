// upsample layer: being written
