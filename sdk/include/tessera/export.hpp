// Symbol visibility for the SDK library. Plugins build with hidden visibility; everything the SDK
// shares with them (classes with vtables, type info, functions) is exported explicitly.
#pragma once

#define TESSERA_API __attribute__((visibility("default")))
