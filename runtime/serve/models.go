package serve

import (
	"fmt"
	"net/http"
	"slices"
)

// modelObject is OpenAI's model object.
type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"` // "model"
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// modelList is the answer of GET /v1/models.
type modelList struct {
	Object string        `json:"object"` // "list"
	Data   []modelObject `json:"data"`
}

// ownedBy is owned_by of every served model.
const ownedBy = "rpac"

func (s *Server) modelObject(id string) modelObject {
	return modelObject{ID: id, Object: "model", Created: s.created, OwnedBy: ownedBy}
}

// checkModel accepts a request's "model": absent, or one of the served
// names; another is a 404 naming the field.
func (s *Server) checkModel(name string) error {
	if name == "" || slices.Contains(s.cfg.ServedModelNames, name) {
		return nil
	}
	return &paramError{&apiError{http.StatusNotFound, fmt.Sprintf("no model %q here; this server serves %q", name, s.cfg.ServedModelNames)}, "model", codeModelNotFound}
}

func (s *Server) listModels(w http.ResponseWriter, r *http.Request) {
	l := modelList{Object: "list", Data: []modelObject{}}
	for _, n := range s.cfg.ServedModelNames {
		l.Data = append(l.Data, s.modelObject(n))
	}
	writeJSON(w, http.StatusOK, l)
}

func (s *Server) getModel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if id == "" {
		s.listModels(w, r)
		return
	}
	if err := s.checkModel(id); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.modelObject(id))
}
