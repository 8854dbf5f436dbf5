// S3 request signing (checkpoint/detail/sigv4.hpp) against AWS's published examples, and
// s3:// / gs:// directories, endpoints and keys resolved from the environment. Requests signed
// here sent to a real server: test_s3_checkpoints.cpp.

#include <algorithm>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <elastic/checkpoint/detail/object_location.hpp>
#include <elastic/checkpoint/detail/sigv4.hpp>

#include "support/catch.hpp"
#include "support/errors.hpp"
#include "support/process.hpp"

namespace sigv4 = elastic::checkpoint::detail::sigv4;

TEST_CASE("sigv4: AWS's S3 example (GET with a Range) signs to its published signature") {
  sigv4::request r;
  r.method = "GET";
  r.host = "examplebucket.s3.amazonaws.com";
  r.path = "/test.txt";
  r.headers = {{"Range", "bytes=0-9"}};
  r.amz_date = "20130524T000000Z";
  const auto s = sigv4::sign(r, {"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""});
  CHECK(sigv4::sha256_hex(s.canonical_request) == "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  CHECK(s.signature == "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  const std::pair<std::string, std::string> auth{
      "authorization",
      "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,SignedHeaders=host;range;"
      "x-amz-content-sha256;x-amz-date,Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"};
  CHECK(std::find(s.headers.begin(), s.headers.end(), auth) != s.headers.end());
}

TEST_CASE("sigv4: AWS's test suite, query parameters out of order (get-vanilla-query-order-key-case)") {
  sigv4::request r;
  r.host = "example.amazonaws.com";
  r.path = "/";
  r.query = {{"Param2", "value2"}, {"Param1", "value1"}};
  r.amz_date = "20150830T123600Z";
  r.service = "service";
  const auto s = sigv4::sign(r, {"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", ""});
  CHECK(s.query_string == "Param1=value1&Param2=value2");
  CHECK(s.signature == "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500");
}

TEST_CASE("sigv4: what cannot be signed is refused, and names and paths are encoded as S3 reads them") {
  CHECK(sigv4::uri_encode("step 7/a+b~c_d.e-f", true) == "step%207/a%2Bb~c_d.e-f");
  CHECK(sigv4::uri_encode("a/b=c&d", false) == "a%2Fb%3Dc%26d");
  sigv4::request r;
  r.host = "h";
  r.amz_date = "20260101T000000Z";
  r.headers = {{"x-evil", "a\r\nx-injected: 1"}};
  auto sign_code = [&] { return elastic::test::error_of([&] { (void)sigv4::sign(r, {}); }).code(); };
  CHECK(sign_code() == elastic::errc::invalid_argument);
  r.headers.clear();
  r.amz_date = "yesterday";
  CHECK(sign_code() == elastic::errc::invalid_argument);
  // Session tokens are signed, and header values folded as S3 folds them.
  r.amz_date = "20260101T000000Z";
  r.headers = {{"X-Meta", "  two   words  "}};
  const auto s = sigv4::sign(r, {"k", "s", "token"});
  CHECK(s.canonical_request.find("x-amz-security-token:token\n") != std::string::npos);
  CHECK(s.canonical_request.find("x-meta:two words\n") != std::string::npos);
}

namespace {

namespace objects = elastic::checkpoint::detail::objects;

/// An environment of the given variables only.
objects::environment env_of(std::vector<std::pair<std::string, std::string>> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    for (const auto& [k, v] : vars) {
      if (k == name) return v;
    }
    return std::nullopt;
  };
}

elastic::errc code_of(const std::function<void()>& f) { return elastic::test::error_of(f).code(); }

}  // namespace

TEST_CASE("object storage: s3:// and gs:// directories, their endpoints and regions as the AWS tools resolve them") {
  const auto aws = objects::parse_location("s3://my-bucket/runs/job7/", env_of({{"AWS_REGION", "eu-west-3"}}));
  CHECK(aws.bucket == "my-bucket");
  CHECK(aws.prefix == "runs/job7");
  CHECK(aws.endpoint == "https://s3.eu-west-3.amazonaws.com");
  CHECK(aws.region == "eu-west-3");
  CHECK_FALSE(aws.path_style);
  CHECK(aws.host() == "my-bucket.s3.eu-west-3.amazonaws.com");
  CHECK(aws.path_of("step-7/manifest.json") == "/runs/job7/step-7/manifest.json");

  const auto rgw = objects::parse_location("s3://ckpt", env_of({{"AWS_ENDPOINT_URL", "http://10.0.0.5:7480/"}}));
  CHECK(rgw.endpoint == "http://10.0.0.5:7480");
  CHECK(rgw.path_style);
  CHECK(rgw.host() == "10.0.0.5:7480");
  CHECK(rgw.path_of("m.json") == "/ckpt/m.json");
  CHECK(rgw.region == "us-east-1");

  const auto gcs = objects::parse_location("gs://team.ckpt/a/b", env_of({}));
  CHECK(gcs.endpoint == "https://storage.googleapis.com");
  CHECK(gcs.region == "auto");
  CHECK(gcs.path_style);  // a dotted bucket is no host name its certificate covers
  CHECK(gcs.path_of("x") == "/team.ckpt/a/b/x");
  CHECK(objects::is_object_url("gs://b/x"));
  CHECK_FALSE(objects::is_object_url("/shared/ckpt"));

  for (const char* bad : {"s3://", "s3://ab/x", "s3://Bucket/x", "s3://-bucket/x", "s3://a..b/x", "s3://bucket/a//b",
                          "s3://bucket/a/../b", "gs://bucket/a\nb", "file:///x"}) {
    INFO(bad);
    CHECK(code_of([&] { (void)objects::parse_location(bad, env_of({})); }) == elastic::errc::invalid_argument);
  }
  CHECK(code_of([&] {
          (void)objects::parse_location("s3://bucket/x", env_of({{"AWS_ENDPOINT_URL", "ftp://host"}}));
        }) == elastic::errc::invalid_argument);
}

TEST_CASE("object storage: keys from the environment, else the shared credentials file's profile") {
  const auto s3 = objects::parse_location("s3://bucket/x", env_of({}));
  const auto gs = objects::parse_location("gs://bucket/x", env_of({}));
  auto c = objects::resolve_credentials(
      s3, env_of({{"AWS_ACCESS_KEY_ID", "AK"}, {"AWS_SECRET_ACCESS_KEY", "SK"}, {"AWS_SESSION_TOKEN", "T"}}));
  CHECK(c.access_key == "AK");
  CHECK(c.secret_key == "SK");
  CHECK(c.session_token == "T");
  c = objects::resolve_credentials(gs, env_of({{"AWS_ACCESS_KEY_ID", "AK"}, {"AWS_SECRET_ACCESS_KEY", "SK"},
                                               {"GCS_ACCESS_KEY_ID", "GOOG1"}, {"GCS_SECRET_ACCESS_KEY", "GS"}}));
  CHECK(c.access_key == "GOOG1");

  elastic::test::temp_dir dir;
  const std::string file = dir.file("credentials");
  std::ofstream(file) << "# a comment\n[default]\naws_access_key_id = D1\naws_secret_access_key=D2\n\n"
                         "[profile train]\r\n  aws_access_key_id = P1 \r\naws_secret_access_key = P2\r\n"
                         "aws_session_token = P3\n[broken]\naws_access_key_id = only\n";
  c = objects::resolve_credentials(s3, env_of({{"AWS_SHARED_CREDENTIALS_FILE", file}}));
  CHECK(c.access_key == "D1");
  CHECK(c.secret_key == "D2");
  c = objects::resolve_credentials(s3, env_of({{"AWS_SHARED_CREDENTIALS_FILE", file}, {"AWS_PROFILE", "train"}}));
  CHECK(c.access_key == "P1");
  CHECK(c.secret_key == "P2");
  CHECK(c.session_token == "P3");
  CHECK(code_of([&] {
          (void)objects::resolve_credentials(s3, env_of({{"AWS_SHARED_CREDENTIALS_FILE", file}, {"AWS_PROFILE", "broken"}}));
        }) == elastic::errc::corrupt);
  try {
    (void)objects::resolve_credentials(s3, env_of({{"AWS_SHARED_CREDENTIALS_FILE", file}, {"AWS_PROFILE", "none"}}));
    FAIL("a missing profile was taken");
  } catch (const elastic::error& e) {
    CHECK(e.code() == elastic::errc::not_found);
    CHECK_THAT(e.message(), Catch::Matchers::Contains("AWS_ACCESS_KEY_ID") && Catch::Matchers::Contains("[none]"));
  }
  CHECK(code_of([&] { (void)objects::resolve_credentials(s3, env_of({{"HOME", dir.path()}})); }) ==
        elastic::errc::not_found);
}
