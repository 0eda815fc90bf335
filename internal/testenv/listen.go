package testenv

import "strings"

// ListenScript is a Python program for a sandbox that listens on port 8080
// (IPv4 and IPv6) before it exits and leaves a child answering every GET
// with reply, a Python expression of bytes (`b"ok"`): when an exec of it
// returns, the sandbox's server is listening. The port tests and the
// ports benchmark run it.
func ListenScript(reply string) string {
	return strings.Replace(listenScript, "REPLY", reply, 1)
}

const listenScript = `import os, socket, http.server
s = socket.socket(socket.AF_INET6)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.bind(("::", 8080))
s.listen(64)
if os.fork():
    os._exit(0)
os.setsid()
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = REPLY
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
srv = http.server.HTTPServer(("::", 8080), H, bind_and_activate=False)
srv.socket = s
srv.serve_forever()
`
