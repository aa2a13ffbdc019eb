package runtime

import "sync/atomic"

var loadedVersion atomic.Value // string: the version of the last library loaded

func recordVersion(v string) {
	if v != "" {
		loadedVersion.Store(v)
	}
}

// LoadedVersion is the version of the onnxruntime library this process
// loaded last (it stays known after the models are closed), or ORTVersion
// when none was loaded yet.
func LoadedVersion() string {
	if v, ok := loadedVersion.Load().(string); ok {
		return v
	}
	return ORTVersion
}
