package data

import (
	"fmt"
	"log/slog"
)

// DownloadEvent starts the download of the WikiText-2 archive
// ("data.download").
type DownloadEvent struct {
	URL   string
	Bytes int64
}

func (e DownloadEvent) Name() string { return "data.download" }

func (e DownloadEvent) Attrs() []slog.Attr {
	return []slog.Attr{slog.String("url", e.URL), slog.Int64("bytes", e.Bytes)}
}

func (e DownloadEvent) Text() string {
	return fmt.Sprintf("wikitext-2: downloading %s (%.1f MiB)", e.URL, float64(e.Bytes)/(1<<20))
}

// DownloadProgressEvent is the download's progress, every tenth of the
// archive ("data.download.progress"); on a terminal it is redrawn in place.
type DownloadProgressEvent struct{ Done, Total int64 }

func (e DownloadProgressEvent) Name() string { return "data.download.progress" }

func (e DownloadProgressEvent) Live() bool { return e.Done < e.Total }

func (e DownloadProgressEvent) Attrs() []slog.Attr {
	return []slog.Attr{slog.Int64("bytes", e.Done), slog.Int64("total", e.Total)}
}

func (e DownloadProgressEvent) Text() string {
	return fmt.Sprintf("wikitext-2: %d/%d bytes (%d%%)", e.Done, e.Total, e.Done*100/max(1, e.Total))
}

// DataReadyEvent: the downloaded files are in place ("data.ready").
type DataReadyEvent struct{ Dir string }

func (e DataReadyEvent) Name() string { return "data.ready" }

func (e DataReadyEvent) Attrs() []slog.Attr { return []slog.Attr{slog.String("dir", e.Dir)} }

func (e DataReadyEvent) Text() string { return "wikitext-2: files ready in " + e.Dir }
