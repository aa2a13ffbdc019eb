package serve

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// corsMaxAge is how long a browser may cache a preflight answer.
const corsMaxAge = 600

// corsMethods are the methods a cross-origin request may use.
const corsMethods = "GET, POST, OPTIONS"

// cors answers cross-origin requests from the origins of AllowOrigins
// ("*": any): it adds Access-Control-Allow-Origin (and Vary: Origin) to
// their answers and answers their preflight OPTIONS requests itself (204;
// 403 for another origin). Without AllowOrigins it adds nothing.
func (s *Server) cors(next http.Handler) http.Handler {
	if len(s.cfg.AllowOrigins) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		allowed := origin != "" && (slices.Contains(s.cfg.AllowOrigins, "*") || slices.Contains(s.cfg.AllowOrigins, origin))
		w.Header().Add("Vary", "Origin")
		if allowed {
			w.Header().Set("Access-Control-Allow-Origin", origin)
		}
		if r.Method != http.MethodOptions || r.Header.Get("Access-Control-Request-Method") == "" {
			next.ServeHTTP(w, r)
			return
		}
		if !allowed { // a preflight from an origin not allowed
			s.metrics.instrument("other", s.cfg.WriteTimeout, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				writeError(w, r, http.StatusForbidden, "cross-origin requests from "+strconv.Quote(origin)+" are not allowed (rpac serve --allow-origin)")
			})).ServeHTTP(w, r)
			return
		}
		h := w.Header()
		h.Set("Access-Control-Allow-Methods", corsMethods)
		if req := r.Header.Get("Access-Control-Request-Headers"); req != "" {
			h.Set("Access-Control-Allow-Headers", req)
		}
		h.Set("Access-Control-Max-Age", strconv.Itoa(corsMaxAge))
		h.Add("Vary", "Access-Control-Request-Method")
		h.Add("Vary", "Access-Control-Request-Headers")
		w.WriteHeader(http.StatusNoContent)
	})
}

// ParseOrigins splits --allow-origin values (each one origin or a comma
// list) into origins.
func ParseOrigins(values []string) []string {
	var out []string
	for _, v := range values {
		for o := range strings.SplitSeq(v, ",") {
			if o = strings.TrimSpace(o); o != "" {
				out = append(out, o)
			}
		}
	}
	return out
}
