// Package fieldstrip removes named members from a stream of JSON, at any depth,
// without decoding it. v1_gateway strips its strip_fields from every response of the
// upstream with it; it knows nothing of Caddy or HTTP, so any program can use it.
//
// A Filter is an io.Writer in front of another. It copies a stream of JSON values
// through, leaving out every object member whose name is in its Fields, with the
// commas around it. Names match once their escapes are decoded, and in any case, as
// encoding/json matches members to struct fields. Its memory does not grow with the
// document: a 50 MB array streams through it. Invalid JSON is an error (ErrSyntax,
// ErrDepth, ErrTruncated), after which it writes nothing more.
//
//	fields := fieldstrip.NewFields([]string{"config", "org_id"})
//	f := fieldstrip.NewFilter(w, fields, false)
//	defer f.Release()
//	if _, err := io.Copy(f, body); err != nil { … }
//	if err := f.Close(); err != nil { … } // the stream ended mid-value
//
// A body whose label does not say JSON (IsJSONType) may be JSON all the same: a
// sniffing Filter (NewFilter's sniff) strips it if it is, and passes it through
// untouched if not.
package fieldstrip
