/* gpu.h — whether the tests' GPU halves run here: a CUDA build, and a session on the GPU opens for
 * the model (else they print a visible SKIP). */
#ifndef MUSER_TEST_GPU_H
#define MUSER_TEST_GPU_H

#include "session.h"

#include <string.h>

static inline bool gpu_present(const muser_model *m)
{
#ifdef MUSER_HAVE_CUDA
    muser_session_opts so;
    memset(&so, 0, sizeof so);
    so.backend = MUSER_BACKEND_CUDA;
    so.n_ctx = 64;
    muser_session *s = NULL;
    muser_error err = {0};
    const bool ok = muser_session_new(&s, m, &so, &err) == 0;
    muser_session_free(s);
    return ok;
#else
    (void)m;
    return false;
#endif
}

#endif
