// server/model_info.c: what rank 0 knows of the current model (model_info.h).
#include <stdlib.h>
#include <string.h>

#include "model_info.h"

void ddld_model_info_free(ddld_model_info *mi)
{
    for (int i = 0; i < mi->nweights; i++) {
        free(mi->weights[i].name);
    }
    free(mi->weights);
    for (int i = 0; i < mi->npartitions; i++) {
        free(mi->part_name[i]);
        free(mi->part_ranks[i]);
        free(mi->part_shape[i]);
    }
    free(mi->part_name);
    free(mi->part_ranks);
    free(mi->part_shape);
    free(mi->part_nranks);
    free(mi->part_ndims);
    memset(mi, 0, sizeof *mi);
}
