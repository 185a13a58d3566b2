// partition/group_internal.h: the broadcast/reduce group builders with a local status.
// `local` is this rank's outcome so far (e.g. the caller's own allocation): the members
// agree on it, together with the builders' own allocations, before any communicator is
// created, so one member's failure fails them all. DDL_OK gives the public functions.
#ifndef DDL_PARTITION_GROUP_INTERNAL_H
#define DDL_PARTITION_GROUP_INTERNAL_H

#include "ddl/partition.h"

ddl_status ddl__group_pair_broadcast(const ddl_partition_t *P_src, const ddl_partition_t *P_dest,
                                     bool transpose_src, bool transpose_dest, ddl_status local,
                                     ddl_group_pair *out);
ddl_status ddl__group_pair_reduce(const ddl_partition_t *P_src, const ddl_partition_t *P_dest,
                                  bool transpose_src, bool transpose_dest, ddl_status local,
                                  ddl_group_pair *out);

#endif // DDL_PARTITION_GROUP_INTERNAL_H
