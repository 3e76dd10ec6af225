// commands.hpp — the `meshtrain <verb>` entry points. Each verb lives in <verb>_command.cpp and takes the
// arguments after the verb (argv[0] is the verb). It returns the process exit code; UserError reaches main().
#pragma once

namespace meshtrain::cli {

int run_command(int argc, char** argv);        // meshtrain run: start host processes (launcher)
int commcheck_command(int argc, char** argv);  // meshtrain commcheck: collectives over every mesh axis, checked
int plan_command(int argc, char** argv);       // meshtrain plan: mesh, device assignment (and more) without starting

}  // namespace meshtrain::cli
