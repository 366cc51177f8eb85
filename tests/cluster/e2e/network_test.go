// Package network runs upstream Kubernetes' network end-to-end specs against a running cluster.
//
// Importing k8s.io/kubernetes/test/e2e/network registers its Ginkgo specs ([sig-network]
// Services, Networking, Conntrack, EndpointSlice, DNS, ...). Upstream runs them from e2e.test
// (k8s.io/kubernetes/test/e2e), which pulls in every other suite too and does not build from
// the published staging modules. This file is what those specs need from the surrounding test
// binary: the framework's flags, the Gomega fail handler and Ginkgo configuration, and the
// suite-level setup that test/e2e/e2e.go does (wait until the nodes and kube-system pods are
// ready, count the nodes, record the cluster's IP family).
//
// tests/cluster/build-e2e.sh compiles it with `go test -c` into e2e-network.test, which takes
// the same flags as e2e.test, for example:
//
//	e2e-network.test --kubeconfig=admin.kubeconfig --provider=local \
//	    --ginkgo.focus='\[sig-network\] Services' --ginkgo.skip='\[Slow\]|\[Serial\]'
package network

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/logs"
	"k8s.io/component-base/version"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/test/e2e/framework"
	e2edebug "k8s.io/kubernetes/test/e2e/framework/debug"
	e2enode "k8s.io/kubernetes/test/e2e/framework/node"
	e2epod "k8s.io/kubernetes/test/e2e/framework/pod"
	utilnet "k8s.io/utils/net"

	// klog's flags (-v, --vmodule, ...) on the command line, as in e2e.test.
	_ "k8s.io/component-base/logs/testinit"
	// The specs under test.
	_ "k8s.io/kubernetes/test/e2e/network"
	// Framework extensions that e2e.test also links in: dump a failed spec's namespace,
	// require all nodes still Ready after each spec, grab metrics when asked to by flags.
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	// Gomega's object formatting as in e2e.test (shorter failure messages).
	_ "k8s.io/kubernetes/test/utils/format"
)

func TestMain(m *testing.M) {
	// testing.MainStart has already registered the -test.* flags on flag.CommandLine.
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unexpected arguments: %q\n", flag.Args())
		os.Exit(2)
	}
	// Checks the specs, applies --list-tests/--list-labels, the provider, report dir, Gomega
	// defaults; exits on bad flags.
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

func TestNetworkE2E(t *testing.T) {
	logs.InitLogs()
	defer logs.FlushLogs()
	// InitLogs turns contextual logging off; the framework's logging expects it on.
	klog.EnableContextualLogging(true)

	gomega.RegisterFailHandler(framework.Fail)
	// Randomized order; without --ginkgo.focus/skip/label-filter, [Flaky] and [Feature:*] are skipped.
	suiteConfig, reporterConfig := framework.CreateGinkgoConfig()
	ginkgo.RunSpecs(t, "Kubernetes e2e network suite", suiteConfig, reporterConfig)
}

var _ = ginkgo.SynchronizedBeforeSuite(func(ctx context.Context) []byte {
	// Once, on the first Ginkgo process: is the cluster ready for tests at all?
	c, err := framework.LoadClientset()
	framework.ExpectNoError(err, "loading the client")
	timeouts := framework.NewTimeoutContext()

	framework.ExpectNoError(e2enode.WaitForAllNodesSchedulable(ctx, c, timeouts.NodeSchedulable))
	err = e2epod.WaitForAlmostAllPodsReady(ctx, c, metav1.NamespaceSystem,
		framework.TestContext.MinStartupPods, framework.TestContext.AllowedNotReadyNodes,
		timeouts.SystemPodsStartup)
	if err != nil {
		e2edebug.DumpAllNamespaceInfo(ctx, c, metav1.NamespaceSystem)
		framework.Failf("kube-system pods are not running and ready: %v", err)
	}

	framework.Logf("e2e test version: %s", version.Get().GitVersion)
	if v, err := c.Discovery().ServerVersion(); err != nil {
		framework.Logf("cannot read the kube-apiserver version: %v", err)
	} else {
		framework.Logf("kube-apiserver version: %s", v.GitVersion)
	}
	return nil
}, func(ctx context.Context, _ []byte) {
	// On every Ginkgo process: the framework.TestContext fields the specs read.
	c, err := framework.LoadClientset()
	framework.ExpectNoError(err, "loading the client")

	// --num-nodes unset: the ready, schedulable nodes (specs that need two nodes skip on fewer).
	if framework.TestContext.CloudConfig.NumNodes == framework.DefaultNumNodes {
		nodes, err := e2enode.GetReadySchedulableNodes(ctx, c)
		framework.ExpectNoError(err, "listing ready schedulable nodes")
		framework.TestContext.CloudConfig.NumNodes = len(nodes.Items)
	}

	// The primary IP family is that of the default/kubernetes Service's ClusterIP.
	svc, err := c.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
	framework.ExpectNoError(err, "reading the default/kubernetes Service")
	framework.TestContext.IPFamily = "ipv4"
	if utilnet.IsIPv6String(svc.Spec.ClusterIP) {
		framework.TestContext.IPFamily = "ipv6"
	}
	framework.Logf("nodes: %d, cluster IP family: %s",
		framework.TestContext.CloudConfig.NumNodes, framework.TestContext.IPFamily)
})
