// broadcast: implementation in progress
