package api

import "net/http"

// The codes of Error: each names a kind of error.
const (
	CodeInvalid      = "invalid"
	CodeUnauthorized = "unauthorized"
	CodeForbidden    = "forbidden"
	CodeNotFound     = "not_found"
	CodeConflict     = "conflict"
	CodeTooLarge     = "too_large"
	CodeQuota        = "quota_exceeded"
	CodeUnavailable  = "unavailable"
	CodeInternal     = "internal"
)

// ErrorCode is one row of ErrorCodes.
type ErrorCode struct {
	Code   string
	Status int // the HTTP status atoll answers an error of this code with
	// Also are other statuses that mean this code: the server answers 431
	// for headers too large, and proxies in front of it 502 and 504 for an
	// unreachable upstream. Clients that get an answer without a JSON body
	// classify it by status.
	Also []int
}

// ErrorCodes is the one table of error codes and their HTTP statuses. The
// REST server, the sandbox agent, the E2B-compatible API, its envd and the
// SDKs all derive their statuses from it; a surface that differs (E2B's
// envd answers a full disk with 507) states only the difference.
//
// Quota is 429 rather than 507: the limit is the tenant's, not the server's
// storage, and clients already treat 429 as "wait or free something up".
var ErrorCodes = []ErrorCode{
	{Code: CodeInvalid, Status: http.StatusBadRequest},
	{Code: CodeUnauthorized, Status: http.StatusUnauthorized},
	{Code: CodeForbidden, Status: http.StatusForbidden},
	{Code: CodeNotFound, Status: http.StatusNotFound},
	{Code: CodeConflict, Status: http.StatusConflict},
	{Code: CodeTooLarge, Status: http.StatusRequestEntityTooLarge, Also: []int{http.StatusRequestHeaderFieldsTooLarge}},
	{Code: CodeQuota, Status: http.StatusTooManyRequests},
	{Code: CodeUnavailable, Status: http.StatusServiceUnavailable, Also: []int{http.StatusBadGateway, http.StatusGatewayTimeout}},
	{Code: CodeInternal, Status: http.StatusInternalServerError},
}

// StatusOf is the HTTP status of code; 500 for a code not in ErrorCodes.
func StatusOf(code string) int {
	for _, e := range ErrorCodes {
		if e.Code == code {
			return e.Status
		}
	}
	return http.StatusInternalServerError
}

// CodeOf is the code an answer with status and no JSON body is read as, or
// "" if status is none of ErrorCodes'.
func CodeOf(status int) string {
	for _, e := range ErrorCodes {
		if e.Status == status {
			return e.Code
		}
		for _, s := range e.Also {
			if s == status {
				return e.Code
			}
		}
	}
	return ""
}
