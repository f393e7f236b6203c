// How reward/math_answer reads a final answer out of a text, as verl's judges read them
// (verl/utils/reward_score/gsm8k.py and math.py), and how it compares two answers.
#pragma once

#include <optional>
#include <string>

namespace tessera_plugins::math_answer {

// GSM8K's strict format: the number after the last "#### " in the text's last 300 characters
// (verl's `#### (\-?[0-9\.\,]+)`), its commas and dollar signs dropped.
std::optional<std::string> gsm8k_answer(const std::string& text);
// The contents of the last \boxed{...} (or "\boxed X" up to a $), braces balanced: verl's
// last_boxed_only_string and remove_boxed (a \fbox{...} there fails remove_boxed: none here).
std::optional<std::string> boxed_answer(const std::string& text);
// The last number in the text's last 300 characters (verl's "flexible" GSM8K method: the last
// match of `(\-?[0-9\.\,]+)` other than "."; its commas are kept, as verl keeps them).
std::optional<std::string> last_number(const std::string& text);

// Two answers agree: as numbers where both read as one (commas, dollar signs and surrounding
// spaces dropped: "1,000" is 1000, "72.0" is 72), else as the same text once trimmed.
bool same_answer(const std::string& a, const std::string& b);

}  // namespace tessera_plugins::math_answer
