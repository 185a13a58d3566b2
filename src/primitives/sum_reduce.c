// sum_reduce: implementation in progress
