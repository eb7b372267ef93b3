import hashlib
from glob import glob
from pathlib import Path

from setuptools import Extension, find_packages, setup

package_name = 'mbfg_ros'
KERNEL_SOURCE = 'mbfg_ros/native/_kernel.c'
# The kernel carries the SHA-256 of the source it was compiled from (mbfg_ros.native.SOURCE_SHA256): the tests
# compare it with the source beside them, so a stale build or an installed kernel from other sources fails them.
kernel_sha256 = hashlib.sha256((Path(__file__).resolve().parent / KERNEL_SOURCE).read_bytes()).hexdigest()

setup(
    name=package_name,
    version='0.1.0',
    packages=find_packages(exclude=['test']),
    data_files=[
        ('share/ament_index/resource_index/packages', ['resource/' + package_name]),
        ('share/' + package_name, ['package.xml']),
        ('share/' + package_name + '/launch', glob('launch/*.py')),
        ('share/' + package_name + '/config', glob('config/*.yaml') + glob('config/*.xml')),
        ('share/' + package_name + '/mechanisms', glob('mechanisms/*.yaml')),
    ],
    # the per-step numerics in C (mbfg_ros.native): required, their only implementation in the package (a build
    # without a C compiler and Python's headers fails here rather than installing a package that cannot run)
    ext_modules=[Extension('mbfg_ros.native._kernel', [KERNEL_SOURCE],
                           define_macros=[('MBFG_KERNEL_SOURCE_SHA256', f'"{kernel_sha256}"')])],
    install_requires=['setuptools'],
    zip_safe=False,
    maintainer='mbfg_ros maintainers',
    maintainer_email='mbfg_ros@example.com',
    description='Real-time multibody state estimation with factor graphs (GTSAM) for ROS 2',
    license='Apache-2.0',
    tests_require=['pytest'],
    extras_require={'test': ['pytest']},
    python_requires='>=3.10',
    entry_points={
        'console_scripts': [
            'mbfg = mbfg_ros.cli.commands:main',
            'estimator = mbfg_ros.ros.programs:estimator',
            'four_bar_sim = mbfg_ros.ros.programs:four_bar_sim',
            'mbfg_demo = mbfg_ros.ros.demo:main',
        ],
    },
)
