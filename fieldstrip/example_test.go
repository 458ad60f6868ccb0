package fieldstrip_test

import (
	"fmt"
	"os"
	"strings"

	"github.com/keygate/keygate/fieldstrip"
)

func Example() {
	fields := fieldstrip.NewFields([]string{"config", "org_id"})
	f := fieldstrip.NewFilter(os.Stdout, fields, false)
	defer f.Release()
	body := `{"data":[{"id":"m1","Config":{"url":"x"},"name":"api"}],"org_id":"o1"}`
	if _, err := strings.NewReader(body).WriteTo(f); err != nil {
		fmt.Println(err)
	}
	if err := f.Close(); err != nil {
		fmt.Println(err)
	}
	// Output: {"data":[{"id":"m1","name":"api"}]}
}
