/*
 * comm_mpi.h - the grid's MPI communicator, for libraries that take one
 * (parallel HDF5: H5Pset_fapl_mpio). Apart from comm.h so that only their
 * callers need <mpi.h>.
 */
#ifndef MC_COMM_MPI_H
#define MC_COMM_MPI_H

#include <mpi.h>
#include "mc/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The world communicator of g; MPI_COMM_NULL for a grid without MPI. It
 * stays the grid's: do not free it; use it for collectives of every rank
 * in the same order, bracketed by mc_grid_deadline_begin/_end (HDF5
 * duplicates the communicator it is given). */
MPI_Comm mc_grid_world_comm(const mc_grid *g);

#ifdef __cplusplus
}
#endif
#endif
