/* ledger.h — the consumer's replay ledger: every session id it has accepted a manifest for, kept
 * in a file (one id in hex a line, appended and fsync'ed before any tile of the session is
 * read), so a session is installed at most once, by this process or any later one using the same
 * file. Several processes may share the file: each claim takes an exclusive flock and first reads
 * what the others appended. A line that is not an id makes the ledger refuse to open (fail
 * closed). It grows by 33 bytes a session. */
#ifndef MUSER_HANDOFF_LEDGER_H
#define MUSER_HANDOFF_LEDGER_H

#include "handoff/wire.h"

typedef struct handoff_ledger handoff_ledger;

/* Opens (creating it, and its directory, when missing) and reads the file. */
int handoff_ledger_open(handoff_ledger **out, const char *path, muser_error *err);
void handoff_ledger_close(handoff_ledger *l);
/* Records id, or refuses (MUSER_E_ARG, "seen before") when any user of the file recorded it. */
int handoff_ledger_claim(handoff_ledger *l, const uint8_t id[HX_ID_BYTES], muser_error *err);
/* $XDG_STATE_HOME/muser/handoff.ledger, else $HOME/.local/state/muser/handoff.ledger. */
int handoff_ledger_default_path(char *out, size_t cap, muser_error *err);

#endif
