// Did-you-mean suggestions for unknown keys, components and references.
#pragma once

#include <string>
#include <vector>

namespace tessera::core {

// The candidate closest to `word` by edit distance, or "" when none is close enough.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);
// " (did you mean 'x'?)" or "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);
// "a, b, c"
std::string join(const std::vector<std::string>& items, const std::string& separator = ", ");

}  // namespace tessera::core
