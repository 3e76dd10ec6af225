// preemption.hpp — a job stopped by its scheduler (SIGTERM, or SIGINT at a terminal) saves and ends cleanly.
//
// The first signal only raises this host's flag; the trainer asks every device whether any host's flag is up once
// per step (agree_on_preemption, one small allreduce over the world), so that every device of every host stops after
// the same step, saves it, and the hosts exit 0. A second signal ends the process at once (exit 128 + signal).
#pragma once

namespace meshtrain::runtime {

class Comm;

// Installs the SIGTERM and SIGINT handlers. Call once per process, before training starts.
void install_preemption_handlers();

// The signal that asked this host to stop (SIGTERM, SIGINT), or 0.
int preemption_signal();

// True on every member of `world` when any member's host has been asked to stop. A collective: every device calls
// it at the same point of every step.
bool agree_on_preemption(Comm& world);

}  // namespace meshtrain::runtime
