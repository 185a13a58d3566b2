// ddl_example_status: prints a daemon's health and training status.
//
//   build/bin/ddl_example_status HOST:PORT | @ADDRESS_FILE
#include <stdio.h>
#include <string.h>

#include "ddl_client.h"

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: ddl_example_status HOST:PORT | @ADDRESS_FILE\n");
        return 2;
    }
    char        buf[512];
    const char *address = argv[1];
    if (address[0] == '@') {
        FILE *f = fopen(address + 1, "r");
        if (!f || !fgets(buf, sizeof buf, f)) {
            fprintf(stderr, "ddl_example_status: cannot read %s\n", address + 1);
            return 1;
        }
        fclose(f);
        buf[strcspn(buf, "\r\n")] = '\0';
        address                   = buf;
    }
    ddl_client_options o = ddl_client_options_default();
    o.connect_timeout_s  = 5;
    ddl_client_t *c;
    if (ddl_client_connect(address, &o, &c) != DDL_OK) {
        fprintf(stderr, "ddl_example_status: %s\n", ddl_last_error());
        return 1;
    }
    ddl_health_status h;
    if (ddl_client_health_check(c, "", &h) == DDL_OK)
        printf("health: %s\n", h == DDL_HEALTH_SERVING       ? "SERVING"
                               : h == DDL_HEALTH_NOT_SERVING ? "NOT_SERVING"
                                                             : "UNKNOWN");
    else
        printf("health: error %s\n", ddl_last_error());
    ddl_client_status_info s;
    if (ddl_client_get_status(c, &s) != DDL_OK) {
        fprintf(stderr, "ddl_example_status: %s\n", ddl_last_error());
        ddl_client_destroy(&c);
        return 1;
    }
    printf("state %s, world size %d, model %s%s, step %lld, last loss %.4f\n"
           "queue %d/%d, durable step %lld, epoch %lld batch %lld, data '%s'\n",
           s.state, s.world_size, s.has_model ? s.model_name : "(none)", s.has_model ? "" : "",
           (long long)s.step, s.last_loss, s.queue_depth, s.queue_capacity,
           (long long)s.durable_step, (long long)s.epoch, (long long)s.batch, s.data_dir);
    ddl_client_destroy(&c);
    return 0;
}
