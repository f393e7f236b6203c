#include "jinja_text.hpp"

#include <algorithm>
#include <cctype>

#include "jinja_value.hpp"

namespace tessera::text::jinja {

bool is_python_space(const std::string& cp) {
  if (cp.size() == 1) {
    const char c = cp[0];
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f');
  }
  static const char* const spaces[] = {"\u0085", "\u00a0", "\u1680", "\u2000", "\u2001", "\u2002", "\u2003",
                                       "\u2004", "\u2005", "\u2006", "\u2007", "\u2008", "\u2009", "\u200a",
                                       "\u2028", "\u2029", "\u202f", "\u205f", "\u3000"};
  return std::any_of(std::begin(spaces), std::end(spaces), [&](const char* s) { return cp == s; });
}

std::string strip(const std::string& s, const std::string* chars, bool left, bool right) {
  const std::vector<std::string> cps = code_points(s);
  std::vector<std::string> set;
  if (chars) set = code_points(*chars);
  const auto strippable = [&](const std::string& cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : is_python_space(cp);
  };
  std::size_t begin = 0, end = cps.size();
  if (left) {
    while (begin < end && strippable(cps[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strippable(cps[end - 1])) --end;
  }
  std::string out;
  for (std::size_t i = begin; i < end; ++i) out += cps[i];
  return out;
}

std::vector<std::string> split(const std::string& s, const std::string* sep, std::int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep) {
    if (!from_right) {
      std::size_t pos = 0;
      for (std::int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
        const std::size_t at = s.find(*sep, pos);
        if (at == std::string::npos) break;
        parts.push_back(s.substr(pos, at - pos));
        pos = at + sep->size();
      }
      parts.push_back(s.substr(pos));
      return parts;
    }
    std::size_t end = s.size();
    for (std::int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
      if (end < sep->size()) break;
      const std::size_t at = s.rfind(*sep, end - sep->size());
      if (at == std::string::npos) break;
      parts.push_back(s.substr(at + sep->size(), end - at - sep->size()));
      end = at;
    }
    parts.push_back(s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
    return parts;
  }
  // On whitespace runs: no empty parts; the last part keeps its text after maxsplit splits.
  const std::vector<std::string> cps = code_points(s);
  std::vector<std::pair<std::size_t, std::size_t>> words;  // code-point ranges
  for (std::size_t i = 0; i < cps.size();) {
    while (i < cps.size() && is_python_space(cps[i])) ++i;
    if (i == cps.size()) break;
    const std::size_t b = i;
    while (i < cps.size() && !is_python_space(cps[i])) ++i;
    words.emplace_back(b, i);
  }
  const auto join = [&](std::size_t b, std::size_t e) {
    std::string out;
    for (std::size_t i = b; i < e; ++i) out += cps[i];
    return out;
  };
  if (maxsplit < 0 || static_cast<std::size_t>(maxsplit) + 1 >= words.size()) {
    for (const auto& [b, e] : words) parts.push_back(join(b, e));
    return parts;
  }
  const auto m = static_cast<std::size_t>(maxsplit);
  if (!from_right) {
    for (std::size_t w = 0; w < m; ++w) parts.push_back(join(words[w].first, words[w].second));
    std::size_t rest = words[m].first;
    std::size_t end = cps.size();
    while (end > rest && is_python_space(cps[end - 1])) --end;
    parts.push_back(join(rest, end));
    return parts;
  }
  const std::size_t first_kept = words.size() - m;
  std::size_t begin = 0;
  while (begin < cps.size() && is_python_space(cps[begin])) ++begin;
  parts.push_back(join(begin, words[first_kept - 1].second));
  for (std::size_t w = first_kept; w < words.size(); ++w) parts.push_back(join(words[w].first, words[w].second));
  return parts;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  std::string line;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || c == '\x1c' || c == '\x1d' || c == '\x1e') {
      lines.push_back(line);
      line.clear();
      if (c == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      line += c;
    }
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

std::string replace(const std::string& s, const std::string& old, const std::string& with, std::int64_t n) {
  std::string out;
  if (old.empty()) {
    // Python inserts `with` before every code point and at the end.
    std::int64_t done = 0;
    for (const auto& cp : code_points(s)) {
      if (n < 0 || done < n) out += with, ++done;
      out += cp;
    }
    if (n < 0 || done < n) out += with;
    return out;
  }
  std::size_t pos = 0;
  for (std::int64_t done = 0; n < 0 || done < n; ++done) {
    const std::size_t at = s.find(old, pos);
    if (at == std::string::npos) break;
    out.append(s, pos, at - pos);
    out += with;
    pos = at + old.size();
  }
  out.append(s, pos, std::string::npos);
  return out;
}

std::string change_case(const std::string& s, const std::string& how) {
  std::string out = s;
  bool word_start = true, first = true;
  for (char& c : out) {
    const auto u = static_cast<unsigned char>(c);
    const bool letter = std::isalpha(u) != 0;
    if (how == "upper") {
      c = static_cast<char>(std::toupper(u));
    } else if (how == "lower") {
      c = static_cast<char>(std::tolower(u));
    } else if (how == "swapcase") {
      c = static_cast<char>(std::isupper(u) ? std::tolower(u) : std::toupper(u));
    } else if (how == "capitalize") {
      c = static_cast<char>(first ? std::toupper(u) : std::tolower(u));
    } else if (how == "title") {
      c = static_cast<char>(word_start ? std::toupper(u) : std::tolower(u));
    }
    // Python's title() starts a word after any character that is not a letter (cased).
    word_start = !letter && u < 0x80;
    first = false;
  }
  return out;
}

std::int64_t count(const std::string& s, const std::string& needle) {
  if (needle.empty()) return static_cast<std::int64_t>(code_points(s).size()) + 1;
  std::int64_t n = 0;
  for (std::size_t pos = s.find(needle); pos != std::string::npos; pos = s.find(needle, pos + needle.size())) ++n;
  return n;
}

std::int64_t find(const std::string& s, const std::string& needle, bool last) {
  const std::size_t at = last ? s.rfind(needle) : s.find(needle);
  if (at == std::string::npos) return -1;
  return static_cast<std::int64_t>(code_points(s.substr(0, at)).size());
}

bool character_class(const std::string& s, const std::string& name) {
  if (s.empty()) return false;
  bool cased = false;
  for (const auto& cp : code_points(s)) {
    if (cp.size() > 1) {
      if (name == "isspace" ? !is_python_space(cp) : true) return false;
      continue;
    }
    const auto u = static_cast<unsigned char>(cp[0]);
    if (name == "isdigit" && !std::isdigit(u)) return false;
    if (name == "isalpha" && !std::isalpha(u)) return false;
    if (name == "isalnum" && !std::isalnum(u)) return false;
    if (name == "isspace" && !is_python_space(cp)) return false;
    if (name == "isupper" && std::islower(u)) return false;
    if (name == "islower" && std::isupper(u)) return false;
    cased = cased || std::isalpha(u);
  }
  return (name == "isupper" || name == "islower") ? cased : true;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace tessera::text::jinja
