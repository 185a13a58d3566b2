// server/exit_codes.h: distdld's exit codes, the ones mpirun passes on (docs/SERVER.md,
// "Rank faults", keeps the same table). A leaf header: no includes.
#ifndef DDLD_EXIT_CODES_H
#define DDLD_EXIT_CODES_H

#define DDLD_EXIT_OK 0         // clean shutdown
#define DDLD_EXIT_START 2      // bad command line or a failed start-up, on every rank
#define DDLD_EXIT_CORRUPT 3    // the --resume checkpoint is corrupt
#define DDLD_EXIT_RANK_FAULT 4 // the watchdog ended the job (watchdog.c)
#define DDLD_EXIT_MPI 5        // an MPI call of the command channel failed (channel.c)

#endif // DDLD_EXIT_CODES_H
