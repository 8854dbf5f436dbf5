// Timer scopes (the worker side) and the watchdog that enforces them.
#pragma once

#include <elastic/timer/client.hpp>
#include <elastic/timer/expires.hpp>
#include <elastic/timer/watchdog.hpp>
