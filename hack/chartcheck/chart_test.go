package chartcheck

import (
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/loader"
	release "helm.sh/helm/v4/pkg/release/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

func TestX(t *testing.T) {
	_ = action.NewInstall
	_ = loader.Load
	_ = release.Release{}
	_ = unstructured.Unstructured{}
	_ = krusty.MakeKustomizer
	_ = filesys.MakeFsOnDisk
	_ = yaml.Marshal
}
