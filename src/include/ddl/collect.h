// ddl/collect.h: gather and scatter of boxed pieces of a distributed tensor.
#ifndef DDL_COLLECT_H
#define DDL_COLLECT_H

#include <mpi.h>

#include "ddl/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

// Gathers the pieces (boxes) of a distributed tensor onto base rank `root`, into
// `global_out` (which root allocates with the global shape; other ranks pass NULL).
// Collective over comm; boxes may be empty and must tile the global tensor.
DDL_EXTERN ddl_status ddl_gather_boxes(MPI_Comm comm, int root, const ddl_tensor_t *local,
                                       const ddl_box *box, const ddl_shape *global,
                                       ddl_tensor_t *global_out);
// The inverse: root scatters `global_in` and every rank receives its box into local.
DDL_EXTERN ddl_status ddl_scatter_boxes(MPI_Comm comm, int root, const ddl_tensor_t *global_in,
                                        const ddl_box *box, const ddl_shape *global,
                                        ddl_tensor_t *local);

#ifdef __cplusplus
}
#endif
#endif // DDL_COLLECT_H
