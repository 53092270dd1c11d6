// Command certmanager runs cert-manager's own controllers (CA and self-signed issuers,
// the certificate lifecycle, the request approver) from its published module, so the test
// bed can prove Statefleet's cert-manager path against the real thing. cert-manager's
// command is a module the Go proxy does not serve; this main stands in for it.
package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/cert-manager/cert-manager/pkg/controller"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster")
	namespace := flag.String("cluster-resource-namespace", "cert-manager", "namespace of ClusterIssuer secrets")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = logf.NewContext(ctx, logf.Log, "controller")
	log := logf.FromContext(ctx)

	opts := controller.ContextOptions{
		Kubeconfig:         *kubeconfig,
		KubernetesAPIQPS:   20,
		KubernetesAPIBurst: 50,
		IssuerOptions:      controller.IssuerOptions{ClusterResourceNamespace: *namespace},
		CertificateOptions: controller.CertificateOptions{
			CertificateRequestMinimumBackoffDuration: time.Minute,
			CertificateRequestMaximumBackoffDuration: 10 * time.Minute,
		},
	}
	factory, err := controller.NewContextFactory(ctx, opts)
	if err != nil {
		log.Error(err, "building the controller context")
		os.Exit(1)
	}
	var wg sync.WaitGroup
	for name, build := range controller.Known() {
		loop, err := build(factory)
		if err != nil {
			log.Error(err, "building a controller", "controller", name)
			os.Exit(1)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			log.Info("starting controller", "controller", name)
			if err := loop.Run(5, ctx); err != nil {
				log.Error(err, "controller stopped", "controller", name)
				os.Exit(1)
			}
		}()
	}
	shared, err := factory.Build()
	if err != nil {
		log.Error(err, "building the informers")
		os.Exit(1)
	}
	shared.KubeSharedInformerFactory.Start(ctx.Done())
	shared.SharedInformerFactory.Start(ctx.Done())
	shared.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())
	shared.GWShared.Start(ctx.Done())
	wg.Wait()
}
