package endpoints

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"

	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// ErrInvalidFile is wrapped by every error about the content of an
// endpoints file or a models annotation.
var ErrInvalidFile = errors.New("endpoints: invalid endpoints file")

// MaxFileBytes bounds an endpoints file; a larger one is refused unread.
const MaxFileBytes = 4 << 20

// fileSpec is the endpoints file: YAML or JSON, decoded strictly (an
// unknown or duplicate field is an error, keys are case-sensitive).
//
//	tenant: team-a            # required: the index tenant
//	hashScheme: vllm          # optional, default "vllm"
//	endpoints:                # may be empty
//	- replicaId: pod-a        # the id its kvevent subscriber reports
//	  address: 10.0.0.7:8000  # ip:port, [v6]:port
//	models:                   # optional: request model name -> index scope
//	- name: my-lora
//	  modelId: meta-llama/Llama-3.1-8B-Instruct
//	  adapterId: my-lora      # optional: empty for a base-model alias
type fileSpec struct {
	Tenant     string         `json:"tenant"`
	HashScheme string         `json:"hashScheme,omitempty"`
	Endpoints  []endpointSpec `json:"endpoints"`
	Models     []modelSpec    `json:"models,omitempty"`
}

type endpointSpec struct {
	ReplicaID string `json:"replicaId"`
	Address   string `json:"address"`
}

// modelSpec is one entry of the file's models list and of the
// inferencecache.io/models annotation of an InferencePool.
type modelSpec struct {
	Name      string `json:"name"`
	ModelID   string `json:"modelId"`
	AdapterID string `json:"adapterId,omitempty"`
}

// DecodeFile decodes and validates the content of an endpoints file (YAML
// or JSON; see the package doc for the schema). Errors wrap ErrInvalidFile,
// or NewPool's ErrInvalidPool and ErrInvalidEndpoint.
func DecodeFile(data []byte) (*Pool, error) {
	p, _, err := decodeFile(data)
	return p, err
}

// decodeFile is DecodeFile with the Observer reason of a failure.
func decodeFile(data []byte) (*Pool, string, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, ReasonDecode, fmt.Errorf("%w: the file is empty", ErrInvalidFile)
	}
	var spec fileSpec
	if err := decodeStrict(data, &spec); err != nil {
		return nil, ReasonDecode, err
	}
	models, err := modelMap(spec.Models, "models")
	if err != nil {
		return nil, ReasonInvalid, err
	}
	eps := make([]Endpoint, len(spec.Endpoints))
	for i, e := range spec.Endpoints {
		eps[i] = Endpoint(e)
	}
	p, err := NewPool(spec.Tenant, spec.HashScheme, models, eps)
	if err != nil {
		return nil, ReasonInvalid, err
	}
	return p, "", nil
}

// decodeModels decodes the inferencecache.io/models annotation: a YAML or
// JSON list of modelSpec.
func decodeModels(data []byte) (map[string]Model, error) {
	var list []modelSpec
	if err := decodeStrict(data, &list); err != nil {
		return nil, err
	}
	return modelMap(list, "models")
}

// decodeStrict decodes YAML or JSON into v: duplicate keys (in YAML or
// JSON), unknown fields and case-mismatched keys are errors naming the
// field's path ("endpoints[1].adress").
func decodeStrict(data []byte, v any) error {
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidFile, err)
	}
	strict, err := kjson.UnmarshalStrict(j, v)
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		// Say it in the file's terms, not the Go types'.
		return fmt.Errorf("%w: field %q: want %s, got %s", ErrInvalidFile, te.Field, jsonKind(te.Type), te.Value)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidFile, err)
	}
	if len(strict) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidFile, errors.Join(strict...))
	}
	return nil
}

// jsonKind names what a Go type decodes from.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return t.Kind().String()
}

// modelMap indexes a models list by name; field names the list in errors.
func modelMap(list []modelSpec, field string) (map[string]Model, error) {
	if len(list) == 0 {
		return nil, nil
	}
	m := make(map[string]Model, len(list))
	for i, e := range list {
		if e.Name == "" || e.ModelID == "" {
			return nil, fmt.Errorf("%w: %s[%d]: name and modelId must both be set", ErrInvalidFile, field, i)
		}
		if _, dup := m[e.Name]; dup {
			return nil, fmt.Errorf("%w: %s[%d]: model name %q listed twice", ErrInvalidFile, field, i, e.Name)
		}
		m[e.Name] = Model{ModelID: e.ModelID, AdapterID: e.AdapterID}
	}
	return m, nil
}
