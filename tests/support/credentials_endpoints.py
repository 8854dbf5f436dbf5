#!/usr/bin/env python3
"""The endpoints a cloud platform hands a pod its object-storage credentials from, modelled for
tests/test_s3_credentials.cpp (the real ones exist only inside AWS and Google Cloud): an STS
AssumeRoleWithWebIdentity (EKS IAM roles for service accounts), a container credentials endpoint
(EKS Pod Identity, ECS), the GCE/GKE metadata server's token, and a GCS-like bucket listing that
records the Authorization header it was sent. The keys handed out are the ones given on the
command line (a real radosgw's), valid for LIFETIME seconds, so a client that signs with them
is checked by the real server.
  credentials_endpoints.py KEY SECRET TOKEN LIFETIME LOG
Prints its port, then serves until killed; every request is appended to LOG as
"METHOD PATH AUTHORIZATION"."""
import datetime, http.server, json, sys, urllib.parse

key, secret, token, lifetime, log = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]


def expiration():
    t = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=lifetime)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, body, kind):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        with open(log, "a") as f:
            f.write("%s %s %s\n" % (self.command, self.path, self.headers.get("Authorization", "-")))
        url = urllib.parse.urlparse(self.path)
        q = urllib.parse.parse_qs(url.query)
        if url.path.startswith("/sts"):
            if q.get("Action") != ["AssumeRoleWithWebIdentity"] or q.get("WebIdentityToken") != [token]:
                return self.reply(403, "<ErrorResponse><Error><Code>AccessDenied</Code>"
                                       "<Message>bad web identity token</Message></Error></ErrorResponse>",
                                  "application/xml")
            return self.reply(200, "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult>"
                                   "<Credentials><AccessKeyId>%s</AccessKeyId><SecretAccessKey>%s</SecretAccessKey>"
                                   "<SessionToken></SessionToken><Expiration>%s</Expiration></Credentials>"
                                   "</AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>"
                              % (key, secret, expiration()), "application/xml")
        if url.path == "/container-credentials":
            if self.headers.get("Authorization") != token:
                return self.reply(401, "{}", "application/json")
            return self.reply(200, json.dumps({"AccessKeyId": key, "SecretAccessKey": secret, "Token": "",
                                               "Expiration": expiration()}), "application/json")
        if url.path == "/computeMetadata/v1/instance/service-accounts/default/token":
            if self.headers.get("Metadata-Flavor") != "Google":
                return self.reply(403, "{}", "application/json")
            return self.reply(200, json.dumps({"access_token": token, "expires_in": lifetime,
                                               "token_type": "Bearer"}), "application/json")
        if url.path.startswith("/gcs-bucket"):
            return self.reply(200, "<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>",
                              "application/xml")
        self.reply(404, "", "text/plain")


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
