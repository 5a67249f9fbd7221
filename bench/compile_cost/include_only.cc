// The include floor: a translation unit that includes the Syncer's header
// and uses nothing of it (bench/compile_cost.sh).
#include <string>

#include "setpoint/processor/syncer.h"

int main() { return 0; }
