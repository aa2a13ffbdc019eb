package data

import (
	"fmt"

	"github.com/rpac-dev/rpac/internal/logging"
)

// DownloadEvent starts the download of the WikiText-2 archive
// ("data.download").
type DownloadEvent struct {
	_     logging.Name `log:"data.download"`
	URL   string       `log:"url"`
	Bytes int64        `log:"bytes"`
}

func (e DownloadEvent) Text() string {
	return fmt.Sprintf("wikitext-2: downloading %s (%.1f MiB)", e.URL, float64(e.Bytes)/(1<<20))
}

// DownloadProgressEvent is the download's progress, every tenth of the
// archive ("data.download.progress"); on a terminal it is redrawn in place.
type DownloadProgressEvent struct {
	_     logging.Name `log:"data.download.progress"`
	Done  int64        `log:"bytes"`
	Total int64        `log:"total"`
}

func (e DownloadProgressEvent) Live() bool { return e.Done < e.Total }

func (e DownloadProgressEvent) Text() string {
	return fmt.Sprintf("wikitext-2: %d/%d bytes (%d%%)", e.Done, e.Total, e.Done*100/max(1, e.Total))
}

// DataReadyEvent: the downloaded files are in place ("data.ready").
type DataReadyEvent struct {
	_   logging.Name `log:"data.ready"`
	Dir string       `log:"dir"`
}

func (e DataReadyEvent) Text() string { return "wikitext-2: files ready in " + e.Dir }
