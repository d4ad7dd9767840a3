/* synth_model.h — a tiny-preset model of arch with matrices of type (a synth type), written to a
 * temporary file and loaded (CHECK-counted; NULL on failure): what the engine's tests run on. */
#ifndef MUSER_TESTS_SYNTH_MODEL_H
#define MUSER_TESTS_SYNTH_MODEL_H

#include <stdio.h>
#include <unistd.h>

#include "check.h"
#include "model.h"
#include "synth.h"

static inline muser_model *check_synth_model(const char *tag, muser_arch arch, int type)
{
    char path[256];
    snprintf(path, sizeof path, "%s_%s_%d_%d.gguf", tag, muser_arch_name(arch), type, (int)getpid());
    muser_synth_opts so;
    muser_synth_opts_default(&so);
    so.arch = arch;
    so.preset = MUSER_SYNTH_TINY;
    so.type = type;
    so.n_threads = 2;
    muser_error err = {0};
    muser_model *m = NULL;
    CHECK_OK(muser_synth_write(&so, path, NULL, &err), &err);
    CHECK_OK(muser_model_load(&m, path, &err), &err);
    unlink(path);
    return m;
}

#endif
