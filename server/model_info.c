// server/model_info.c: what rank 0 knows of the current model (model_info.h).
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "model_info.h"

void ddld_model_info_free(ddld_model_info *mi)
{
    for (int i = 0; i < mi->nweights; i++) {
        ddl_free(mi->weights[i].name);
    }
    ddl_free(mi->weights);
    for (int i = 0; i < mi->npartitions; i++) {
        ddl_free(mi->part_name[i]);
        ddl_free(mi->part_ranks[i]);
        ddl_free(mi->part_shape[i]);
    }
    ddl_free(mi->part_name);
    ddl_free(mi->part_ranks);
    ddl_free(mi->part_shape);
    ddl_free(mi->part_nranks);
    ddl_free(mi->part_ndims);
    ddl_free(mi->layers);
    memset(mi, 0, sizeof *mi);
}
