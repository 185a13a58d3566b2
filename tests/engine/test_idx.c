// Placeholder: being written.
#include "test.h"
int main(void)
{
    return 0;
}
