// all_sum_reduce: implementation in progress
