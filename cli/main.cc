// granary: the command line. See cli/cli.h.
#include "cli/cli.h"

int main(int argc, char** argv) { return granary::cli::Main(argc, argv); }
