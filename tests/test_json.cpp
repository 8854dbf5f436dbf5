#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <elastic/internal/json.hpp>
#include <elastic/error.hpp>

#include "support/catch.hpp"
#include "support/errors.hpp"

using elastic::errc;
using elastic::internal::json;

namespace {

using elastic::test::error_of;

bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

}  // namespace

TEST_CASE("scalars keep their type and value") {
  CHECK(json().is_null());
  CHECK(json(nullptr).is_null());
  CHECK(json(true).as_bool());
  CHECK(json(false).is_bool());
  CHECK(json(-7).as_int64() == -7);
  CHECK(json(2.5).as_double() == 2.5);
  CHECK(json(2.5).is_double());
  CHECK(json("text").as_string() == "text");
  CHECK(json(std::string("s")).is_string());
  CHECK(json(std::string_view("v")).as_string() == "v");
  CHECK(json(1.0) != json(1));  // a double stays a double
}

TEST_CASE("integers of every width construct exactly") {
  CHECK(json(std::uint32_t{4000000000u}).as_uint64() == 4000000000u);
  CHECK(json(std::size_t{12}).as_int64() == 12);
  CHECK(json(static_cast<unsigned char>(255)).as_int64() == 255);
  CHECK(json(static_cast<short>(-3)).as_int64() == -3);
  CHECK(json(7L).is_integer());
  CHECK(json(7ull).is_integer());
  CHECK(json(std::numeric_limits<std::int64_t>::min()).as_int64() == std::numeric_limits<std::int64_t>::min());
  CHECK(json(std::numeric_limits<std::uint64_t>::max()).as_uint64() == std::numeric_limits<std::uint64_t>::max());
  CHECK(json(std::uint64_t{5}) == json(5));  // one form per number
}

TEST_CASE("64-bit extremes survive a round trip through text") {
  const auto u_max = std::numeric_limits<std::uint64_t>::max();
  const auto i_min = std::numeric_limits<std::int64_t>::min();
  const auto i_max = std::numeric_limits<std::int64_t>::max();
  CHECK(json(u_max).dump() == "18446744073709551615");
  CHECK(json(i_min).dump() == "-9223372036854775808");
  CHECK(json::parse("18446744073709551615").as_uint64() == u_max);
  CHECK(json::parse("-9223372036854775808").as_int64() == i_min);
  CHECK(json::parse("9223372036854775807").as_int64() == i_max);
  CHECK(json::parse("9223372036854775808").as_uint64() == std::uint64_t{1} << 63);
  CHECK(json::parse("-0").as_int64() == 0);
}

TEST_CASE("integer getters refuse values outside their range") {
  const auto too_big = error_of([] { (void)json(std::numeric_limits<std::uint64_t>::max()).as_int64(); });
  CHECK(too_big.code() == errc::corrupt);
  CHECK(contains(too_big.what(), "18446744073709551615"));
  const auto negative = error_of([] { (void)json(-1).as_uint64(); });
  CHECK(negative.code() == errc::corrupt);
  CHECK(contains(negative.what(), "expected an unsigned integer, got -1"));
  CHECK(error_of([] { (void)json(1.0).as_int64(); }).code() == errc::corrupt);
}

TEST_CASE("a getter of the wrong type says what it expected and what it got") {
  const auto e = error_of([] { (void)json("7").as_uint64(); });
  CHECK(e.code() == errc::corrupt);
  CHECK(contains(e.what(), "expected an unsigned integer, got a string"));
  CHECK(contains(error_of([] { (void)json(1).as_string(); }).what(), "expected a string, got an integer"));
  CHECK(contains(error_of([] { (void)json().as_bool(); }).what(), "expected a boolean, got null"));
  CHECK(contains(error_of([] { (void)json(true).elements(); }).what(), "expected an array, got a boolean"));
  CHECK(contains(error_of([] { (void)json::array().items(); }).what(), "expected an object, got an array"));
}

TEST_CASE("as_double accepts integers") {
  CHECK(json(3).as_double() == 3.0);
  CHECK(json(std::uint64_t{1} << 63).as_double() == 9223372036854775808.0);
  CHECK(json::parse("-12").as_double() == -12.0);
}

TEST_CASE("doubles round trip exactly through their shortest text") {
  CHECK(json(0.1).dump() == "0.1");
  CHECK(json(1.0).dump() == "1.0");
  CHECK(json(-0.0).dump() == "-0.0");
  CHECK(json(1e300).dump() == "1e+300");
  CHECK(std::signbit(json::parse("-0.0").as_double()));
  CHECK(json::parse("1E+2").as_double() == 100.0);
  CHECK(json::parse("1e2").is_double());
  CHECK(json::parse("2.5e-3").as_double() == 0.0025);
  CHECK(json::parse("5e-324").as_double() == std::numeric_limits<double>::denorm_min());

  std::mt19937_64 gen(7);
  std::size_t differ = 0;
  for (int k = 0; k < 20000; ++k) {
    const double d = std::bit_cast<double>(gen());
    if (!std::isfinite(d)) continue;
    const json back = json::parse(json(d).dump());
    if (!back.is_double() || std::bit_cast<std::uint64_t>(back.as_double()) != std::bit_cast<std::uint64_t>(d)) ++differ;
  }
  CHECK(differ == 0);
}

TEST_CASE("NaN and infinities, which JSON cannot hold, are written as null") {
  CHECK(json(std::numeric_limits<double>::quiet_NaN()).dump() == "null");
  CHECK(json(std::numeric_limits<double>::infinity()).dump() == "null");
  CHECK(json(-std::numeric_limits<double>::infinity()).dump() == "null");
}

TEST_CASE("strings are escaped on output and unescaped on input") {
  const std::string nasty = std::string("q\"b\\s/n\nr\rt\tc\x01\x1f") + '\0' + "\x7f\xc3\xa9";
  const std::string text = json(nasty).dump();
  CHECK(text == "\"q\\\"b\\\\s/n\\nr\\rt\\tc\\u0001\\u001f\\u0000\x7f\xc3\xa9\"");
  CHECK(json::parse(text).as_string() == nasty);
  CHECK(json::parse(R"("\b\f\/\u00e9\u20AC\ud83d\ude00")").as_string() == "\b\f/\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
}

TEST_CASE("objects keep insertion order and operator[] inserts or replaces") {
  json j;
  j["zeta"] = 1;
  j["alpha"] = "a";
  j["mid"] = json::array();
  j["zeta"] = 2;  // replaces in place
  REQUIRE(j.is_object());
  CHECK(j.size() == 3);
  CHECK(j.dump() == R"({"zeta":2,"alpha":"a","mid":[]})");
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.push_back(k);
  CHECK(keys == std::vector<std::string>{"zeta", "alpha", "mid"});
  CHECK(json::parse(j.dump()).dump() == j.dump());
}

TEST_CASE("a missing field is corrupt data and find returns null") {
  const json j = json::parse(R"({"a":1})");
  CHECK(j.find("a") != nullptr);
  CHECK(j.find("b") == nullptr);
  CHECK(json(1).find("a") == nullptr);
  const auto e = error_of([&] { (void)j.at("step"); });
  CHECK(e.code() == errc::corrupt);
  CHECK(contains(e.what(), "missing field 'step'"));
}

TEST_CASE("arrays grow with push_back and are read by index") {
  json a;
  a.push_back(1);
  a.push_back("two");
  a.push_back(json::object());
  REQUIRE(a.is_array());
  CHECK(a.size() == 3);
  CHECK(a.at(0).as_int64() == 1);
  CHECK(a.at(1).as_string() == "two");
  CHECK(a.elements().back().is_object());
  CHECK(a.dump() == R"([1,"two",{}])");
  const auto e = error_of([&] { (void)a.at(std::size_t{3}); });
  CHECK(e.code() == errc::corrupt);
  CHECK(contains(e.what(), "missing element 3 of an array of 3"));
}

TEST_CASE("building the wrong kind of container is a misuse") {
  json a = json::array();
  CHECK(error_of([&] { a["key"] = 1; }).code() == errc::invalid_argument);
  json o = json::object();
  CHECK(error_of([&] { o.push_back(1); }).code() == errc::invalid_argument);
  json s = "text";
  CHECK(error_of([&] { s.push_back(1); }).code() == errc::invalid_argument);
}

TEST_CASE("nested structures round trip compact and pretty") {
  json doc;
  doc["format"] = "elastic-checkpoint";
  doc["version"] = 1;
  doc["step"] = std::uint64_t{18446744073709551615u};
  doc["loss"] = 0.125;
  doc["ok"] = true;
  doc["none"] = nullptr;
  json entry;
  entry["name"] = "w\t1";
  entry["shape"] = json(json::array_t{json(3), json(4)});
  entry["crc32c"] = json::array();
  doc["entries"] = json(json::array_t{entry, json::object(), json::array()});

  const std::string compact = doc.dump();
  CHECK(compact ==
        R"({"format":"elastic-checkpoint","version":1,"step":18446744073709551615,"loss":0.125,"ok":true,)"
        R"("none":null,"entries":[{"name":"w\t1","shape":[3,4],"crc32c":[]},{},[]]})");
  CHECK(json::parse(compact) == doc);

  const std::string pretty = doc.dump(2);
  CHECK(pretty == R"({
  "format": "elastic-checkpoint",
  "version": 1,
  "step": 18446744073709551615,
  "loss": 0.125,
  "ok": true,
  "none": null,
  "entries": [
    {
      "name": "w\t1",
      "shape": [
        3,
        4
      ],
      "crc32c": []
    },
    {},
    []
  ]
})");
  CHECK(json::parse(pretty) == doc);
  CHECK(json::parse(pretty).dump() == compact);
}

TEST_CASE("whitespace around and between tokens is accepted") {
  const json j = json::parse(" \t\r\n{ \"a\" : [ 1 , 2 ] ,\n\"b\":{}}\n ");
  CHECK(j.at("a").at(std::size_t{1}).as_int64() == 2);
  CHECK(j.at("b").size() == 0);
}

TEST_CASE("nesting is accepted to 64 levels and refused beyond") {
  const auto nested = [](int depth) { return std::string(static_cast<std::size_t>(depth), '[') + std::string(static_cast<std::size_t>(depth), ']'); };
  CHECK(json::parse(nested(json::max_depth)).is_array());
  const auto e = error_of([&] { (void)json::parse(nested(json::max_depth + 1)); });
  CHECK(e.code() == errc::corrupt);
  CHECK(contains(e.what(), "line 1 column 65"));
  CHECK(contains(e.what(), "no more than 64 nested"));
  // A hostile document deep enough to overflow the stack of a naive parser fails the same way.
  CHECK(error_of([&] { (void)json::parse(std::string(1000000, '[')); }).code() == errc::corrupt);
  CHECK(error_of([&] { (void)json::parse(std::string(100000, '{')); }).code() == errc::corrupt);
}

TEST_CASE("malformed input is corrupt, located by line and column, and says what was expected") {
  struct bad {
    std::string text;
    int line, column;
    std::string_view expected;
  };
  const std::vector<bad> cases = {
      {"", 1, 1, "a value"},
      {"   ", 1, 4, "a value"},
      {"{\"a\":1} x", 1, 9, "the end of the document"},
      {"{}{}", 1, 3, "the end of the document"},
      {"nulll", 1, 5, "the end of the document"},
      {"[1,2]\n\n x", 3, 2, "the end of the document"},
      {"[1,2", 1, 5, "',' or ']'"},
      {"[1 2]", 1, 4, "',' or ']'"},
      {"[1,]", 1, 4, "a value"},
      {"{\"a\" 1}", 1, 6, "':'"},
      {"{a:1}", 1, 2, "a string key"},
      {"{\"a\":1,}", 1, 8, "a string key"},
      {"{\"a\":1", 1, 7, "',' or '}'"},
      {"{\"a\":1,\"a\":2}", 1, 8, "a key not already in this object (\"a\" repeats)"},
      {"{\n  \"a\": 1,\n  \"b\": ?\n}", 3, 8, "a value"},
      {"\"abc", 1, 5, "a closing '\"'"},
      {"\"a\\x\"", 1, 3, "an escape"},
      {"\"a\\", 1, 3, "an escape"},
      {"\"\\u12G4\"", 1, 6, "a hex digit"},
      {"\"\\u00", 1, 6, "a hex digit"},
      {"\"a\tb\"", 1, 3, "a control character to be escaped"},
      {"\"a\nb\"", 1, 3, "a control character to be escaped"},
      {std::string("\"a\0b\"", 5), 1, 3, "a control character to be escaped"},
      {"\"\\udc00\"", 1, 2, "a high surrogate before a low one"},
      {"\"\\ud800x\"", 1, 8, "a low surrogate after a high one"},
      {"\"\\ud800\\u0041\"", 1, 8, "a low surrogate after a high one"},
      {"01", 1, 1, "no leading zero"},
      {"-01", 1, 2, "no leading zero"},
      {"-", 1, 2, "a digit"},
      {"-a", 1, 2, "a digit"},
      {"1.", 1, 3, "a digit after '.'"},
      {"1.e5", 1, 3, "a digit after '.'"},
      {"1e", 1, 3, "a digit in the exponent"},
      {"1e+", 1, 4, "a digit in the exponent"},
      {".5", 1, 1, "a value"},
      {"+1", 1, 1, "a value"},
      {"0x10", 1, 2, "the end of the document"},
      {"tru", 1, 1, "'true'"},
      {"fals", 1, 1, "'false'"},
      {"nul", 1, 1, "'null'"},
      {"True", 1, 1, "a value"},
      {"NaN", 1, 1, "a value"},
      {"Infinity", 1, 1, "a value"},
      {"'a'", 1, 1, "a value"},
      {"[1,2] // comment", 1, 7, "the end of the document"},
      {"\xef\xbb\xbf{}", 1, 1, "a value"},
      {"18446744073709551616", 1, 1, "an integer that fits 64 bits"},
      {"[-9223372036854775809]", 1, 2, "an integer that fits 64 bits"},
      {"1e400", 1, 1, "a number within the range of a double"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    const auto e = error_of([&] { (void)json::parse(c.text); });
    CHECK(e.code() == errc::corrupt);
    const std::string where = "line " + std::to_string(c.line) + " column " + std::to_string(c.column) + ": expected ";
    CAPTURE(e.what());
    CHECK(contains(e.what(), where));
    CHECK(contains(e.what(), c.expected));
  }
}
