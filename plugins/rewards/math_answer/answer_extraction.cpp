#include "answer_extraction.hpp"

#include <cmath>
#include <cstdlib>

namespace tessera_plugins::math_answer {
namespace {

bool numeric_char(char c) { return (c >= '0' && c <= '9') || c == '.' || c == ','; }

std::string without(std::string text, const std::string& chars) {
  std::string out;
  for (char c : text) {
    if (chars.find(c) == std::string::npos) out += c;
  }
  return out;
}

std::string trimmed(const std::string& text) {
  const auto begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return {};
  return text.substr(begin, text.find_last_not_of(" \t\r\n") - begin + 1);
}

std::optional<double> as_number(const std::string& text) {
  const std::string plain = trimmed(without(text, ",$"));
  if (plain.empty()) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(plain.c_str(), &end);
  if (end != plain.c_str() + plain.size() || !std::isfinite(value)) return std::nullopt;
  // strtod also reads hexadecimal, inf and nan: only decimal digits count as a number here.
  if (plain.find_first_not_of("0123456789.-+eE") != std::string::npos) return std::nullopt;
  return value;
}

// The last `n` characters (UTF-8 code points, as Python slices a str) of `text`.
std::string last_characters(const std::string& text, std::size_t n) {
  std::size_t start = text.size();
  for (std::size_t kept = 0; start > 0 && kept < n; ++kept) {
    do {
      --start;
    } while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80);
  }
  return text.substr(start);
}

}  // namespace

std::optional<std::string> gsm8k_answer(const std::string& full) {
  const std::string text = last_characters(full, 300);
  std::optional<std::string> last;
  for (std::size_t at = text.find("#### "); at != std::string::npos; at = text.find("#### ", at + 1)) {
    std::size_t i = at + 5;
    std::string number;
    if (i < text.size() && text[i] == '-') number += text[i++];
    const std::size_t digits = i;
    while (i < text.size() && numeric_char(text[i])) number += text[i++];
    if (i > digits) last = without(number, ",$");
  }
  return last;
}

std::optional<std::string> boxed_answer(const std::string& text) {
  // "\boxed 42" (no braces): up to the next $.
  if (const std::size_t spaced = text.rfind("\\boxed "); spaced != std::string::npos) {
    const std::string rest = text.substr(spaced + 7);
    return rest.substr(0, rest.find('$'));
  }
  const std::size_t at = text.rfind("\\boxed");
  const std::size_t name = 6;
  if (at == std::string::npos) return std::nullopt;
  int open = 0;
  for (std::size_t i = at; i < text.size(); ++i) {
    if (text[i] == '{') ++open;
    if (text[i] == '}' && --open == 0) {
      const std::size_t inner = at + name + 1;  // past "\boxed{"
      if (inner > i || text[at + name] != '{') return std::nullopt;
      return text.substr(inner, i - inner);
    }
  }
  return std::nullopt;
}

std::optional<std::string> last_number(const std::string& full) {
  const std::string text = last_characters(full, 300);
  std::optional<std::string> last;
  for (std::size_t i = 0; i < text.size();) {
    std::size_t start = i;
    if (text[i] == '-' && i + 1 < text.size() && numeric_char(text[i + 1])) ++i;
    if (!numeric_char(text[i])) {
      i = start + 1;
      continue;
    }
    while (i < text.size() && numeric_char(text[i])) ++i;
    const std::string match = text.substr(start, i - start);
    if (match != ".") last = match;
  }
  return last;
}

bool same_answer(const std::string& a, const std::string& b) {
  const auto x = as_number(a), y = as_number(b);
  if (x && y) return *x == *y;
  return trimmed(a) == trimmed(b);
}

}  // namespace tessera_plugins::math_answer
