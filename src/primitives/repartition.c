// repartition: implementation in progress
