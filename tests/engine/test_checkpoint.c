// Placeholder: being written.
#include "mpi_test.h"
int main(int argc, char **argv)
{
    ddl_test_mpi_init(&argc, &argv);
    return ddl_test_mpi_finalize();
}
