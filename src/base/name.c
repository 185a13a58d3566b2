#include "ddl/base.h"

#include <string.h>

bool ddl_name_is_portable(const char *name, size_t max_len)
{
    size_t n = name != NULL ? strlen(name) : 0;
    if (n == 0 || n > max_len || name[0] == '.') {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-')) {
            return false;
        }
    }
    return true;
}
