// The one translation unit that holds Catch2 2.x's main; compiled once, linked into every test.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
