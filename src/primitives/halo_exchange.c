// halo_exchange: implementation in progress
